// Command gateway is the front of an mlxserving cluster: the OpenAI API
// (completions, chat and embeddings) over a balancer.LoadBalancer whose backends are the instances found over
// NATS (examples/server -nats ...) and/or any OpenAI-compatible servers
// named with -upstream (mlxserving, vLLM, llama.cpp, mlx_lm.server), with
// API keys, a routing strategy and, with -redis, session homes shared by
// gateway replicas.
//
//	MLXSERVING_NATS_PASSWORD=... go run ./examples/gateway -nats nats://nats.internal:4222 -nats-user gateway \
//	  -api-keys keys.json -strategy weighted -redis 10.0.0.5:6379
//	go run ./examples/gateway -upstream http://10.0.0.7:8000,http://10.0.0.8:8000   # no NATS: a static list
//
// SIGTERM or SIGINT stop it after the requests in flight.
//
// While its NATS connection is down the gateway waits up to
// -nats-reconnect-grace (500 ms) for it to come back (moving to another
// server of a NATS cluster takes milliseconds); once it has been down
// longer, and no -upstream server could take a request instead, requests
// are refused at once with 503 and Retry-After rather than left waiting.
//
// # Watching it
//
// GET /metrics serves Prometheus's text format (an OpenTelemetry
// MeterProvider exporting to a registry of the gateway's own); with
// -api-keys it needs an admin key, as an instance's does. Besides the
// OpenAI handler's HTTP metrics it holds the balancer's
// (balancer.WithMeterProvider):
//
//	mlxserving_lb_requests_total{result}            routed, failover, refused, interrupted, resumed
//	mlxserving_lb_backend_requests_total{backend,result}  routed to it; failover, resumed: left it for another
//	mlxserving_lb_backend_in_flight{backend}        requests open on it
//	mlxserving_lb_backend_healthy{backend}          1 or 0
//	mlxserving_lb_backend_draining{backend}         1 while it drains
//	mlxserving_lb_backend_ttft_seconds{backend}     its peak-EWMA time to first token
//	mlxserving_breaker_state{breaker}               0 closed, 1 half-open, 2 open (as instances report theirs)
//	mlxserving_lb_route_duration_seconds            histogram: arrival until a backend took the request
//	mlxserving_lb_resume_gap_seconds                histogram: what each resume on another backend added to a stream
//	mlxserving_lb_affinity_total{decision}          sessions' requests: home, spilled, moved
//
// and, with -nats, the gateway's own:
//
//	mlxserving_gateway_nats_connected               1 while the NATS connection is up
//	mlxserving_gateway_nats_reconnects_total        its reconnections
//	mlxserving_gateway_instances                    instances discovery knows now
//
// GET /admin/stats answers the same state as JSON, for an operator or a
// script: the request counts, the affinity decisions, the NATS
// connection (status, server, reconnects, instances) and per backend its
// health, draining, breaker (state and window counts), requests in
// flight, routed, failed over and resumed, time to first token and last
// load report (models, waiting, running, KV usage, max batch, when). With
// -api-keys it needs an admin key ("admin": true in the key file): 401
// without a valid key, 403 for another key. Without -api-keys, like the
// rest of the gateway, both are open.
//
//	curl -H "Authorization: Bearer $ADMIN_KEY" http://gateway:8080/admin/stats
package main
