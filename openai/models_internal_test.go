package openai

import (
	"encoding/json"
	"testing"
	"time"
)

func TestParseKeepAlive(t *testing.T) {
	cases := []struct {
		raw  string
		want time.Duration
		nil_ bool
		bad  bool
	}{
		{raw: ``, nil_: true},
		{raw: `null`, nil_: true},
		{raw: `"5m"`, want: 5 * time.Minute},
		{raw: `"1h30m"`, want: 90 * time.Minute},
		{raw: `"0"`, want: 0},
		{raw: `0`, want: 0},
		{raw: `-1`, want: -time.Second},
		{raw: `"-1m"`, want: -time.Minute},
		{raw: `3600`, want: time.Hour},
		{raw: `1.5`, want: 1500 * time.Millisecond},
		{raw: `"soon"`, bad: true},
		{raw: `true`, bad: true},
		{raw: `{}`, bad: true},
		{raw: `1e300`, bad: true},
	}
	for _, c := range cases {
		d, err := parseKeepAlive(json.RawMessage(c.raw))
		switch {
		case c.bad:
			if err == nil || toAPIError(err).status != 400 {
				t.Errorf("%s: %v, %v; want a 400", c.raw, d, err)
			}
		case c.nil_:
			if err != nil || d != nil {
				t.Errorf("%s: %v, %v; want nil", c.raw, d, err)
			}
		case err != nil || d == nil || *d != c.want:
			t.Errorf("%s: %v, %v; want %v", c.raw, d, err, c.want)
		}
	}
}
