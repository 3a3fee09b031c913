package natsbackend

import (
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// ServeOption configures Serve: the options named for Serve and the
// [Option]s both sides take. Options with bad values make Serve return an
// error; nil options are skipped.
type ServeOption interface {
	applyServe(*serveConfig) error
}

// DiscoverOption configures Discover: the options named for Discover and
// the [Option]s both sides take. Options with bad values make Discover
// return an error; nil options are skipped.
type DiscoverOption interface {
	applyDiscover(*discoverConfig) error
}

// serveOption is an option of Serve alone.
type serveOption func(*serveConfig) error

func (o serveOption) applyServe(c *serveConfig) error { return o(c) }

// discoverOption is an option of Discover alone.
type discoverOption func(*discoverConfig) error

func (o discoverOption) applyDiscover(c *discoverConfig) error { return o(c) }

// Option is a setting instances and balancers must agree on, or that
// both have (the logger): it is both a [ServeOption] and a
// [DiscoverOption], so one value configures both sides. The zero Option
// changes nothing.
type Option struct {
	serve    func(*serveConfig) error
	discover func(*discoverConfig) error
}

func (o Option) applyServe(c *serveConfig) error {
	if o.serve == nil {
		return nil
	}
	return o.serve(c)
}

func (o Option) applyDiscover(c *discoverConfig) error {
	if o.discover == nil {
		return nil
	}
	return o.discover(c)
}

// WithService names the micro service instances register under and
// discovery looks for, instead of DefaultService (letters, digits, '-'
// and '_'). Give Serve and Discover the same value.
func WithService(service string) Option {
	set := func(dst *string) error {
		if !nameRe.MatchString(service) {
			return fmt.Errorf("service name %q: want letters, digits, '-' or '_'", service)
		}
		*dst = service
		return nil
	}
	return Option{
		serve:    func(c *serveConfig) error { return set(&c.service) },
		discover: func(c *discoverConfig) error { return set(&c.service) },
	}
}

// WithHeartbeat sets how often an instance sends a heartbeat on a quiet
// stream; a client whose stream is silent for three of them ends it with
// ErrInstanceLost. It must be positive; default DefaultHeartbeat. Give
// Serve and Discover the same value.
func WithHeartbeat(d time.Duration) Option {
	return Option{
		serve:    func(c *serveConfig) error { return positive("heartbeat", d, &c.heartbeat) },
		discover: func(c *discoverConfig) error { return positive("heartbeat", d, &c.client.heartbeat) },
	}
}

// WithLogger receives what Serve logs (failed streams) or Discover logs
// (instances found and lost, NATS trouble). The default discards; nil is
// refused.
func WithLogger(l *slog.Logger) Option {
	set := func(dst **slog.Logger) error {
		if l == nil {
			return errors.New("logger is nil")
		}
		*dst = l
		return nil
	}
	return Option{
		serve:    func(c *serveConfig) error { return set(&c.logger) },
		discover: func(c *discoverConfig) error { return set(&c.logger) },
	}
}
