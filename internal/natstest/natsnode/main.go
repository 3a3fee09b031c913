// Command natsnode runs an embedded nats-server (nats-server/v2) as its
// own process, optionally as a node of a routed cluster: the NATS server
// of tests that kill processes (examples/chaos), built from the module
// with no download.
//
//	natsnode -addr 127.0.0.1:4222 -cluster 127.0.0.1:6222 -routes nats://127.0.0.1:6223,nats://127.0.0.1:6224
//	natsnode -addr 127.0.0.1:-1 -cluster 127.0.0.1:-1   # ports of its own choosing
//
// It prints "ready <client URL>" (and " route <route URL>" with -cluster)
// once it accepts clients, and stops on SIGTERM or SIGINT. A port of -1
// is any free one; a node routed to one node of a cluster learns the
// others from it.
package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "natsnode:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("natsnode", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:4222", "client address (port -1: any free one)")
	cluster := fs.String("cluster", "", "cluster (route) address (port -1: any free one); empty: no cluster")
	routes := fs.String("routes", "", "with -cluster: route URLs of other nodes, comma-separated (one is enough: it tells of the rest)")
	name := fs.String("name", "", "server name (default: nats-server's own)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	opts := &server.Options{ServerName: *name, NoSigs: true, NoLog: true}
	var err error
	if opts.Host, opts.Port, err = hostPort(*addr); err != nil {
		return fmt.Errorf("-addr: %w", err)
	}
	if *cluster != "" {
		opts.Cluster.Name = "natsnode"
		if opts.Cluster.Host, opts.Cluster.Port, err = hostPort(*cluster); err != nil {
			return fmt.Errorf("-cluster: %w", err)
		}
		if *routes != "" {
			opts.Routes = server.RoutesFromStr(*routes)
		}
	} else if *routes != "" {
		return errors.New("-routes needs -cluster")
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return err
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		return errors.New("not ready for connections after 10s")
	}
	if *cluster != "" {
		fmt.Println("ready", "nats://"+ns.Addr().String(), "route", "nats://"+ns.ClusterAddr().String())
	} else {
		fmt.Println("ready", "nats://"+ns.Addr().String())
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	<-sig
	ns.Shutdown()
	ns.WaitForShutdown()
	return nil
}

func hostPort(s string) (string, int, error) {
	h, p, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return "", 0, fmt.Errorf("port %q: %w", p, err)
	}
	return h, port, nil
}
