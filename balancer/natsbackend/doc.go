// Package natsbackend serves and reaches balancer.Backends over NATS,
// with nats.go's micro services for discovery, stats and liveness.
//
// On each instance, [Serve] exposes a backend (a *mlxserving.Server) as a
// micro service:
//
//	svc, err := natsbackend.Serve(nc, "gpu-7", srv)
//	defer svc.Stop()
//
// To stop an instance without losing work (SIGTERM), Drain it: it is
// advertised as draining (balancers route nothing new to it) for a notice,
// then leaves, and returns once its streams ended with their final chunk:
//
//	err := svc.Drain(ctx, 2*natsbackend.DefaultInterval)
//
// On the balancer, [Discover] finds the instances and keeps a
// balancer.Registry (a balancer.LoadBalancer) in step with them:
//
//	d, err := natsbackend.Discover(ctx, nc, lb)
//	defer d.Close()
//
// Every instance is the micro service DefaultService with endpoints
// generate, chat, embed and load on subjects of its own. Discovery asks all of
// them for their stats ($SRV.STATS.<service>) every interval; each answer
// carries the instance's load report, so one broadcast both proves an
// instance alive and refreshes what the balancer routes on. An instance
// that has not answered within the timeout is removed. Between broadcasts
// each known instance is probed on its own load subject every probe
// interval (50 ms by default): the NATS server answers "no responders" at
// once for an instance whose connection is gone (kill -9), so it leaves
// the registry, and every open stream of it ends with ErrInstanceLost,
// within about a probe interval rather than three missed heartbeats: a
// balancer fails over those that produced no token yet and resumes the
// others on another instance. An instance that stops answering without
// closing its connection (a stopped process, a machine cut off the
// network, which the NATS server notices only at its own ping timeout)
// leaves its probes unanswered: after the probe timeout (200 ms by
// default) it is removed the same way. An instance that leaves discovery because
// it is draining keeps its streams.
//
// Security is NATS's own: Serve and Discover take the caller's *nats.Conn,
// so credentials, NKeys and TLS are nats.go options (nats.UserCredentials,
// nats.Nkey, nats.UserInfo, nats.ClientCert). testdata/nats-server.conf is
// a tested server configuration under which only instance users may serve
// (subscribe to the serving subjects and answer discovery) and only gateway
// users may call them; any other user can do neither.
//
// Names are unique: Serve refuses (ErrNameTaken) a name a live instance of
// the service answers under, and a new instance under a known name is
// taken for a restart and replaces the old one; should the old one answer
// again, discovery keeps the newer, logs it once, and does not swap them.
//
// A request is a NATS request to the instance's endpoint, answered at once
// with a start message (or a typed error: nothing was started), after
// which chunks stream to an inbox of the client's. The stream is
// credit-based: the client grants a window of chunks and renews it as it
// reads, so a slow reader never overflows its subscription. While a
// stream is quiet the instance sends heartbeats; a stream that hears
// nothing for the heartbeat timeout ends with ErrInstanceLost — after
// text reached the caller as a *retry.InterruptedError. Closing the
// stream on the client tells the instance to stop the generation.
//
// Chunk messages are numbered, and heartbeats say how many went out, so a
// message lost on the way (a server of a NATS cluster went away with it)
// is noticed: the client asks for the messages from the first it missed,
// and the instance, which keeps a stream's last window of messages (and a
// finished stream until its client has the final chunk), sends them
// again. A stream that does not get them within three heartbeats ends
// with ErrInstanceLost rather than go on without their text.
//
// Embeddings (Client.Embed) travel the same way: the request, answered at
// once with a start message or a typed refusal, heartbeats while the
// instance embeds, then the vectors as raw little-endian float32 after a
// short JSON header (exact, and no JSON scan of megabytes) in as many
// messages as the NATS max_payload needs — 2048 inputs of 1024 values are 8 MiB, the
// default max_payload 1 MiB. A request whose own JSON is over the
// max_payload (long texts, token ids) is sent as several requests of
// consecutive inputs to the same instance, concurrently, and their vectors
// are put back in order: each is a plain request-reply, no server setting
// has to change, and the instance batches them together anyway. Refusals
// arrive as the instance's typed errors (*api.InvalidParamError,
// *engine.ContextLengthError, *scheduler.RateLimitError); an instance lost
// before it answered ends the call with ErrInstanceLost, and a
// balancer sends the request to another instance. A caller's deadline
// travels with the request, so the instance stops on its own too.
//
// An error travels as the instance's classification of it: its code is
// one of package retry's codes (retry.Classify), the same the HTTP API
// sends, with the details the typed error needs on the client (a
// parameter's name, a context-length refusal's numbers, the deadline that
// fired, the Retry-After). Instances of earlier versions sent codes of
// their own ("invalid_param", "context_length", "rate_limited",
// "deadline", "bad_request", "interrupted", "internal"); a client still
// reads those, while a client of an earlier version reads only the codes
// the two share ("model_not_found", "queue_full") as typed errors and the
// rest by the retryable flag the message carries.
//
// A balancer.LoadBalancer over these clients resumes such a stream on
// another instance. Chunks carry their token ids, and the request travels
// as its JSON, api.Params.Resume included: the new instance gets the
// prompt plus the delivered ids and streams only what follows.
package natsbackend
