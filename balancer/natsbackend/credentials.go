package natsbackend

import (
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
)

// Credentials say how an instance or a gateway proves who it is to NATS
// and checks the server (see testdata/nats-server.conf for the users and
// permissions a cluster needs). Zero fields are not used; the zero value
// connects anonymously without TLS.
type Credentials struct {
	// CredsFile is a NATS credentials file (user JWT and NKey seed).
	CredsFile string
	// NKeySeedFile is a file holding a user NKey seed.
	NKeySeedFile string
	// User and Password authenticate with a user name and password.
	User, Password string
	// CAFile is the CA certificate that signed the server's TLS
	// certificate; CertFile and KeyFile are a client certificate, both or
	// neither.
	CAFile, CertFile, KeyFile string
}

// Options returns the nats.go options for c, or an error for a client
// certificate without its key (or the other way round) or an unreadable
// NKey seed.
func (c Credentials) Options() ([]nats.Option, error) {
	var opts []nats.Option
	if c.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(c.CredsFile))
	}
	if c.NKeySeedFile != "" {
		o, err := nats.NkeyOptionFromSeed(c.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("natsbackend: NKey seed: %w", err)
		}
		opts = append(opts, o)
	}
	if c.User != "" {
		opts = append(opts, nats.UserInfo(c.User, c.Password))
	}
	if c.CAFile != "" {
		opts = append(opts, nats.RootCAs(c.CAFile))
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return nil, errors.New("natsbackend: a client certificate needs its key, and the other way round")
	}
	if c.CertFile != "" {
		opts = append(opts, nats.ClientCert(c.CertFile, c.KeyFile))
	}
	return opts, nil
}
