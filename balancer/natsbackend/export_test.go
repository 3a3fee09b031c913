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

// DropChunkMessagesForTest makes s lose the chunk messages drop returns
// true for on the way (they stay in the stream's history for a replay).
func DropChunkMessagesForTest(s *Service, drop func(seq uint64, final bool) bool) { s.drop = drop }
