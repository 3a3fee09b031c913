// Package mlx is the engine that runs decoder-only language models,
// and BERT-family encoders that embed (see Embeddings), in-process on
// MLX (github.com/ml-explore/mlx) through its C API, mlx-c. It loads
// Hugging Face-layout checkpoints of the families in its architecture
// table (arch.go), from config.json and tensor names as transformers
// writes them: llama (llama3 or linear RoPE scaling; yarn for every
// family, serving original_max_position_embeddings × factor positions
// where that is more than max_position_embeddings), mistral, qwen2 (q/k/v biases), qwen3 (q/k norms), gemma2 (soft-capped
// attention and output logits), gemma3_text and the language model of
// gemma3 checkpoints (text_config; weights under language_model.model.
// or model.language_model.), qwen3_moe and mixtral (mixtures of experts
// through gather_mm, gather_qmm when quantized; float experts are held
// in float32 on the CPU, whose gather_mm takes only float32), phi3 (fused projections,
// partial rotary, longrope), olmo2 and gpt_oss (q/k/v/o biases, a
// learned attention sink per head passed to MLX's scaled-dot-product
// attention, sliding and full layers by layer_types, YaRN, experts in
// every layer with biases and a clamped GLU: OpenAI's MXFP4 experts stay
// MXFP4, their bytes being MLX's mxfp4 layout, through gather_qmm in
// mode mxfp4, dequantized ones run through gather_mm; see gptoss.go); GQA; tied embeddings; sharded
// through model.safetensors.index.json; in float32, float16 or bfloat16
// and MLX affine 2- to 8-bit quantized form. Checkpoints quantized for
// transformers load too: AWQ (GEMM), GPTQ (v1 or gptq_v2 zeros, with or
// without act order) and compressed-tensors pack-quantized int4 are
// requantized at load to MLX affine 4-bit with their group size (the same
// values: scale as stored, bias -scale*zero; act order's inputs sorted by
// group, the module's input gathered in that order), and FP8
// (quant_method fp8 with block scales, compressed-tensors float-quantized)
// is dequantized at load to the model's float dtype (MLX has no FP8
// matmul); see hfquant.go. It runs the forward pass as
// MLX ops (fast RMSNorm, RoPE, scaled-dot-product attention), keeps every
// sequence's KV in one preallocated pool, decodes a whole batch of
// sequences of different lengths in one forward pass and samples the
// whole batch on the device. Sliding-window attention (Mistral's and
// Mixtral's sliding_window, Gemma's interleaved sliding layers, Qwen2's
// use_sliding_window) is applied in every attention path, and the pool
// gives back the rows that left the window (see KV cache).
// [Engine.Quantize] writes MLX affine checkpoints from float ones.
//
// # Embeddings
//
// Every model implements engine.Embedder: an embedding sequence
// (OpenPooled) is fed like a prompt and its last input returns, instead of
// a token, the mean, CLS (first token) or last-token pool of the model's
// last hidden state after its final norm, summed in float32 across
// chunks; it reuses no saved prefix and is never saved. Info reports the
// checkpoint's sentence-transformers pooling (engine.ReadPooling) and
// refuses a pipeline it cannot reproduce. Decoder checkpoints of every
// family above embed, bare ones as embedding models publish them
// (Qwen3Model: no "model." prefix; without an lm_head and untied they
// only embed). Two encoder families only embed (engine.Info.Encoder):
// bert (BertModel: absolute positions, token type 0, post-LayerNorm
// layers, exact GELU) and modernbert (ModernBertModel: no-bias
// LayerNorms, fused Wqkv, GeGLU, RoPE with separate global and local
// bases, local layers attending within local_attention/2 positions
// either side, final_norm), bare or under a masked-LM head, in float32,
// float16 or bfloat16 (not quantized). An encoder input attends over
// itself both ways and comes whole in one step; inputs of one length
// attend in one call; no KV outlives the step, and Info.KVCapacity is
// the tokens one step may carry. An encoder's ContextLength is capped at
// the checkpoint's max_seq_length.
//
// # LoRA adapters
//
// Decoder models implement engine.AdapterModel: AddAdapter reads and
// checks a PEFT or mlx-lm adapter (internal/lora) and keeps it on the
// host; OpenAdapter makes it resident in one of Info.AdapterSlots device
// slots (reading it from disk when it is not), evicting the least
// recently used adapter no open sequence runs, or fails with
// engine.ErrOutOfMemory when every slot is in use. Every adaptable module
// of every layer has two stacks over the slots, A^T [slots, in, R] and
// scale·B^T [slots, R, out], R the highest rank made resident (lower ranks
// zero-padded), made when an adapter first targets the module. Sequences
// of different adapters and of the base run in one Step: a step's adapted
// tokens, grouped by slot, add x·A^T·(scale·B^T) to each projection's
// output through two sorted gather_mm per module (a fused q/k/v or
// gate/up product adds its modules' deltas side by side), and a step
// with no adapted token runs no LoRA op at all. The same code serves the
// decode-only layers of fused.go, so their CUDA kernels run with adapters
// too (nothing is captured or compiled per step). On the CPU, whose
// gather_mm takes only float32, the stacks are float32 and the adapted
// rows are cast to it and back. Saved KV is found by its key and the
// adapter that wrote it: a sequence never reuses KV of another adapter,
// of the base, or of an adapter since replaced under its name. The
// slots' memory is not counted in Info's sizes.
//
// Use:
//
//	eng, err := mlx.New(mlx.WithCacheLimit(1 << 30))
//	if err != nil { return err } // wraps engine.ErrUnavailable without -tags mlx
//	defer eng.Close()
//	m, err := eng.Load(ctx, engine.ModelSpec{ID: "llama", Path: dir})
//	out, err := m.Step(ctx, batch)
//
// # Building
//
// The engine is compiled only with the build tag mlx; without it New returns
// an error wrapping engine.ErrUnavailable and the rest of the module builds
// and tests as usual. mlx-c ships no pkg-config file, so point cgo at the
// installed headers and libraries:
//
//	# macOS (brew install mlx mlx-c)
//	export CGO_CFLAGS="-I$(brew --prefix)/include"
//	export CGO_LDFLAGS="-L$(brew --prefix)/lib -Wl,-rpath,$(brew --prefix)/lib"
//	go build -tags mlx ./...
//
//	# Linux, MLX and mlx-c built from source into PREFIX (CPU or CUDA backend)
//	export CGO_CFLAGS="-I$PREFIX/include"
//	export CGO_LDFLAGS="-L$PREFIX/lib -Wl,-rpath,$PREFIX/lib"
//	go build -tags mlx ./...
//
// The package links -lmlxc -lmlx. Build mlx-c as a shared library
// (-DBUILD_SHARED_LIBS=ON), or add MLX's own link dependencies (BLAS,
// LAPACK) to CGO_LDFLAGS for static libraries.
//
// # Threads and memory
//
// All MLX work of an Engine runs on one goroutine locked to an OS thread.
// MLX errors are caught by an error handler installed at start (MLX's
// default one exits the process) and come back as Go errors carrying MLX's
// message. Arrays are freed as soon as a step ends; nothing relies on
// finalizers. Package internal/metal reports and limits MLX's memory.
//
// # KV cache and sampling
//
// The KV cache is a pool of Info.KVCapacity token rows per layer,
// allocated at load in the weights' dtype; a sequence holds one row per
// position, taken as it is fed, and never grows by copying. When the
// window frees rows within the context, sliding layers have rows of
// their own (kvgroups.go): a sequence keeps there only its last
// Window+31 positions, the rows before go back to the pool after each
// step, and the blocks below are the full layers' rows (a Gemma 3
// sequence at 128k holds about a sixth of a full KV). A prefill chunk's
// sliding layers attend the rows before it and its own keys as computed,
// so it needs rows only for the positions it keeps, and a step gives
// back the rows it will neither read nor keep before it takes new ones:
// a decoding sequence holds Window+31 rows, a prompt chunk after the
// first at most Window-1 more (Info.WindowBlocks). Beside full layers
// the sliding rows are one pool sized for MaxBatch+1 sequences' kept
// positions (5.47 GiB for a Gemma-3-12B shape at MaxBatch 16; it was
// twice that before a step gave rows back first); when every layer
// slides they are the blocks, and a sequence is charged at most
// Info.WindowBlocks. A saved prefix keeps the same rows: a prompt
// that leaves it more than 32 tokens before its end reuses nothing and
// recomputes. The pool is
// paged with blocks of one row (Info.BlockSize 1, Info.KVBlocks =
// KVCapacity; the model implements engine.BlockPool), so the batcher
// admits sequences by the rows their prompts take rather than reserving
// each one's whole possible length, and preempts when the pool runs out:
// Open takes no row for a new prompt and shares the rows of a reused
// saved prefix (refcounted, never copied), each fed token takes a row,
// Free returns the rows no other sequence shares, and rows held only by
// saved prefixes count as free and are evicted least recently used first
// when a step needs them. A step that needs more rows than FreeBlocks
// fails with engine.ErrOutOfMemory before it takes or evicts anything.
// Info.ContextLength is capped at the pool, so one sequence always fits
// alone. A step writes its new keys and
// values with one scatter per layer; the one-token (decode) inputs of a
// step attend in one batched scaled-dot-product call per layer over their
// gathered rows (unmasked when they all attend as
// many rows, so MLX can take its fused decode kernel; else padded, with a
// length mask) or, on a CUDA GPU, in one custom kernel that reads each
// sequence's pool rows in place (pooled.go); prompt chunks of the same length at
// the same position attend together, causally. On a CUDA GPU a step of
// decode inputs only runs ten MLX primitives a layer (fused.go: custom
// kernels for residual add + norm, RoPE + KV rows and the gated MLP,
// attention rotating its own queries; gpt_oss, whose attention sinks
// they do not compute, takes neither these nor the pool kernel);
// WithFusedKernels(false) turns
// those kernels off, and Primitives reports a step's count
// (PrimitiveCount).
// Sampling runs for the whole batch on the device (top-k and top-p by
// thresholds, no vocabulary sort; SwiGLU and the sampling noise are
// compiled with MLX's compile) and a seeded draw depends only on the
// seed and how many tokens the sequence has generated (sampled, or forced
// by jump-forward decoding: engine.Info.JumpForward), so it is the same
// alone and in any batch. The model reports engine.Info.Resumes: a
// sequence opened with SamplingParams.Generated set starts its draws at
// that position and counts the prompt's last Generated tokens for
// presence and frequency penalties, so it goes on as the interrupted one
// would have.
//
// # float32 and TF32
//
// On a GPU that has TF32 (CUDA), MLX runs float32 matrix products in
// it, with a 10-bit mantissa, unless the environment sets
// MLX_ENABLE_TF32=0: MLX reads the variable itself, once per process, at
// its first matrix product. The engine neither reads nor sets it. A
// program that needs exact float32 — comparing with a reference pass,
// measuring float32 checkpoints — sets it in main before it starts the
// engine, as examples/server, cmd/mlxbench and this package's tests do:
//
//	if _, set := os.LookupEnv("MLX_ENABLE_TF32"); !set {
//		os.Setenv("MLX_ENABLE_TF32", "0")
//	}
package mlx
