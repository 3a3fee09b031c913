"""The worker's settings: what the supervisor sends on the command line
(--settings, a JSON object; PROTOCOL.md, "Start-up"). The host's
environment configures nothing.

Each field's zero value, where it has one, means the default. Code that
loads a model without a worker (the scripts under testdata/) gets
Settings() as it is.
"""
import dataclasses
import json

from .trace import DEFAULT_STEPS


@dataclasses.dataclass(frozen=True)
class Settings:
    """block_size: tokens per KV block unless the load asks (0: 16).
    window_step: the most tokens one sequence is fed at once within a
    sliding window's blocks (0: the larger of the block size and 64).
    prefix_cache: opens without a key reuse cached full blocks.
    split_steps: steps that mix prompt chunks with decodes run the decodes
    on their CUDA graph and the chunks in a second pass.
    overlap: behind each step the next decode step of its sequences is
    launched before the host reads the tokens (CUDA with the kernels).
    prefill_graphs: steps of prompt chunks replay CUDA graphs captured
    per token count (CUDA, varlen attention, float or FP8/int4 weights): of the whole
    step with prompt_attention, else piecewise around attention.
    prompt_attention: with prefill_graphs, steps of prompt chunks attend
    through the paged prompt-attention kernel, so each replays one graph
    of the whole step (prefill.py), where the kernel passes its check at
    load.
    kv_fraction: the share of the device's free memory a KV pool sized
    from memory takes (CUDA).
    kernels: the Triton kernels run the CUDA decode path.
    varlen: prompt chunks attend in one varlen flash call (CUDA).
    attn_prefetch: the decode attention kernel loads the next tile's block
    ids one tile ahead.
    lora_plan: "auto" (every step's delta through the segmented Triton
    kernels where they run: CUDA with the kernels on, lora.SegmentPlan;
    else the dense LoRA plan for one-token steps and the prompt-step
    graphs, a product per adapter for eager prompt chunks) or "dense"
    (every step's delta over every slot, lora.DensePlan).
    lora_side_stream: the segmented kernels' shrink of each projection on
    a second CUDA stream, beside the base projection's GEMM (both read the
    projection's input alone); the expand then waits for it (default on).
    fp8_scaled_mm: FP8 weights (per channel or in 128x128 blocks) run as
    W8A8 in products of w8a8.MMA_MIN_ROWS rows or more (a Triton kernel
    up to w8a8.MMA_MAX_ROWS, torch._scaled_mm beyond), where that passes
    its check at load; off: weight-only always.
    tp_timeout: seconds a tensor-parallel collective waits at most.
    tp_graphs: CUDA graphs under tensor parallel.
    tp_oneshot: on CUDA, tensor-parallel all-reduces of up to
    tp.OneShot.LIMIT bytes run over peer memory (tp.py), not NCCL.
    profile: the worker profiles itself and logs the profile at exit.
    trace_dir: where the worker writes a device trace of its steps under
    load ("": none; trace.py): torch's profiler records trace_steps steps
    (0: 200) after the first trace_skip, written as trace-<pid>-<n>.json.gz
    with a summary (trace-<pid>-<n>.txt, logged too).
    step_tokens: the most tokens one step carries, which the worker sizes
    its prompt-step graphs for and reports (0: 4096 on CUDA; elsewhere the
    supervisor's default).
    max_lookahead: the most tokens one step input may ask for (PROTOCOL.md,
    "Lookahead"; 0: 64)."""

    block_size: int = 0
    window_step: int = 0
    prefix_cache: bool = True
    split_steps: bool = True
    overlap: bool = True
    prefill_graphs: bool = True
    prompt_attention: bool = True
    kv_fraction: float = 0.8
    kernels: bool = True
    varlen: bool = True
    attn_prefetch: bool = True
    lora_plan: str = "auto"
    lora_side_stream: bool = True
    fp8_scaled_mm: bool = True
    tp_timeout: float = 300.0
    tp_graphs: bool = True
    tp_oneshot: bool = True
    profile: bool = False
    trace_dir: str = ""
    trace_skip: int = 0
    trace_steps: int = 0
    max_lookahead: int = 0
    step_tokens: int = 0

    @property
    def trace_length(self):
        """trace_steps with its default applied."""
        return self.trace_steps or DEFAULT_STEPS

    @property
    def lookahead_limit(self):
        """max_lookahead with its default applied."""
        return self.max_lookahead or 64


LORA_PLANS = ("auto", "dense")


class SettingsError(ValueError):
    """A --settings value the worker refuses; names the key."""


def _fits(v, kind):
    """Whether the JSON value v is of the field type kind (an int is a
    float, a bool is neither)."""
    if isinstance(v, bool):
        return kind is bool
    if kind is float:
        return isinstance(v, (int, float))
    return isinstance(v, kind)


def parse(text):
    """The Settings of a --settings argument (None or empty: the defaults).
    Raises SettingsError for anything but a JSON object of known keys with
    values of their types."""
    if not text:
        return Settings()
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise SettingsError("settings: not JSON: %s" % e)
    if not isinstance(obj, dict):
        raise SettingsError("settings: not a JSON object")
    types = {f.name: f.type for f in dataclasses.fields(Settings)}
    out = {}
    for key, v in obj.items():
        kind = types.get(key)
        if kind is None:
            raise SettingsError("settings: unknown key %r" % key)
        if not _fits(v, kind):
            raise SettingsError("settings: %s is %s, want %s" % (key, json.dumps(v), kind.__name__))
        out[key] = float(v) if kind is float else v
    if out.get("lora_plan", "auto") not in LORA_PLANS:
        raise SettingsError("settings: lora_plan %r, want one of %s" % (out["lora_plan"], ", ".join(LORA_PLANS)))
    for key in ("trace_skip", "trace_steps"):
        if out.get(key, 0) < 0:
            raise SettingsError("settings: %s %d, want 0 or more" % (key, out[key]))
    return Settings(**out)
