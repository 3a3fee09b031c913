package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/balancer/natsbackend"
)

// natsPasswordEnv holds the password for -nats-user (kept out of argv).
const natsPasswordEnv = "MLXSERVING_NATS_PASSWORD"

// clusterFlags say how the server joins a cluster as an instance: NATS
// servers and the credentials of an instance user (see
// balancer/natsbackend/testdata/nats-server.conf for the permissions).
type clusterFlags struct {
	urls, instance            string
	creds, nkey, user         string
	caFile, certFile, keyFile string
	notice, heartbeat         time.Duration
}

func (c *clusterFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.urls, "nats", "", "join a cluster: NATS server URLs, comma-separated (default: no cluster)")
	fs.StringVar(&c.instance, "instance", "", "with -nats: this instance's name, unique in the cluster (default: the host name)")
	fs.StringVar(&c.creds, "nats-creds", "", "with -nats: a NATS credentials file (JWT + NKey)")
	fs.StringVar(&c.nkey, "nats-nkey", "", "with -nats: a file holding an NKey seed")
	fs.StringVar(&c.user, "nats-user", "", "with -nats: a NATS user; the password comes from $"+natsPasswordEnv)
	fs.StringVar(&c.caFile, "nats-ca", "", "with -nats: CA certificate file for the NATS server's TLS")
	fs.StringVar(&c.certFile, "nats-cert", "", "with -nats: client certificate file (TLS), with -nats-key")
	fs.StringVar(&c.keyFile, "nats-key", "", "with -nats: client key file (TLS), with -nats-cert")
	fs.DurationVar(&c.notice, "nats-drain-notice", 2*natsbackend.DefaultInterval,
		"with -nats: how long shutdown advertises the instance as draining before it leaves")
	fs.DurationVar(&c.heartbeat, "nats-heartbeat", natsbackend.DefaultHeartbeat,
		"with -nats: how often a quiet stream tells its gateway it is alive (the gateways' -nats-heartbeat must match)")
}

func (c *clusterFlags) check() error {
	if c.urls == "" {
		if c.instance != "" || c.creds != "" || c.nkey != "" || c.user != "" || c.caFile != "" || c.certFile != "" || c.keyFile != "" {
			return errors.New("-instance and the -nats-* flags need -nats")
		}
		return nil
	}
	if (c.certFile == "") != (c.keyFile == "") {
		return errors.New("-nats-cert and -nats-key go together")
	}
	if c.notice < 0 {
		return fmt.Errorf("-nats-drain-notice %v: want 0 or more", c.notice)
	}
	if c.heartbeat <= 0 {
		return fmt.Errorf("-nats-heartbeat %v: want a positive duration", c.heartbeat)
	}
	return nil
}

// joinCluster serves srv over NATS as an instance when -nats is set and
// returns how to leave: drain (advertised as draining for the notice,
// then the streams in flight end with their final chunk) and close.
func joinCluster(c clusterFlags, srv balancer.Backend, log *slog.Logger) (leave func(context.Context), err error) {
	if c.urls == "" {
		return func(context.Context) {}, nil
	}
	if c.instance == "" {
		if c.instance, err = os.Hostname(); err != nil {
			return nil, fmt.Errorf("-instance: %w", err)
		}
	}
	cred := natsbackend.Credentials{CredsFile: c.creds, NKeySeedFile: c.nkey, User: c.user, Password: os.Getenv(natsPasswordEnv),
		CAFile: c.caFile, CertFile: c.certFile, KeyFile: c.keyFile}
	opts, err := cred.Options()
	if err != nil {
		return nil, err
	}
	opts = append(opts, nats.Name("mlxserving instance "+c.instance), nats.MaxReconnects(-1))
	nc, err := nats.Connect(c.urls, opts...)
	if err != nil {
		return nil, fmt.Errorf("-nats %s: %w", c.urls, err)
	}
	svc, err := natsbackend.Serve(nc, c.instance, srv, natsbackend.WithLogger(log), natsbackend.WithHeartbeat(c.heartbeat))
	if err != nil {
		nc.Close()
		return nil, err
	}
	log.Info("joined the cluster", "nats", nc.ConnectedUrlRedacted(), "instance", c.instance, "id", svc.ID())
	return func(ctx context.Context) {
		log.Info("leaving the cluster", "instance", c.instance, "notice", c.notice)
		if err := svc.Drain(ctx, c.notice); err != nil {
			log.Warn("leaving the cluster", "err", err)
		}
		nc.Close()
	}, nil
}
