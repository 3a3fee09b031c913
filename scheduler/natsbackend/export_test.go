package natsbackend

import "encoding/json"

// FromWireForTest sends err through the wire encoding, as an instance's
// refusal reaches a client.
func FromWireForTest(instance string, err error) error {
	b, _ := json.Marshal(toWire(err))
	var w wireError
	_ = json.Unmarshal(b, &w)
	return fromWire(instance, w)
}
