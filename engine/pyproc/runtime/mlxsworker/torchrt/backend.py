"""The torch backend: decoders with paged KV memory (model.py), encoders
(encserve.py), and tensor parallel over several processes (tp.py)."""
import os

import torch

from .. import params
from ..backend import Backend
from ..stcheck import read_json
from . import tp
from .encoder import is_encoder
from .model import TorchModel, pick_device, pick_dtype


class TorchBackend(Backend):
    name = "torch"

    def __init__(self, settings):
        super().__init__(settings)
        self.group = None  # tp.Group once the worker joined one (join)
        self.threads_set = False  # --threads named a count (set_threads)
        self.gpu_threads = False  # a GPU model set one thread for serving (_gpu_threads)
        self.default_threads = torch.get_num_threads()

    def capabilities(self):
        return {"batch": True, "prefix_cache": True, "logprobs": True, "lookahead": True, "resume": True,
                "jump_forward": True, "adapters": True, "pipeline": True, "sampling": params.features(), "params": params.KEYS}

    def versions(self):
        return {"torch": torch.__version__, "cuda": bool(torch.cuda.is_available())}

    def load(self, path, opts):
        """Loads the checkpoint at path; opts as in PROTOCOL.md's load. An
        encoder (encoder.py) loads as an encserve.EncoderModel."""
        if self.gpu_threads:  # a load converts on the host: every core, as at the first load
            torch.set_num_threads(self.default_threads)
        try:
            m = self._load(path, opts)
        finally:
            if self.gpu_threads:
                torch.set_num_threads(1)
        self._gpu_threads(m.device)
        return m

    def _load(self, path, opts):
        cfg = os.path.join(path, "config.json")
        if os.path.isdir(path) and os.path.exists(cfg) and is_encoder(read_json(cfg, "config.json").get("model_type")):
            from .encserve import EncoderModel
            device = pick_device(opts.get("device", "auto"))
            return EncoderModel(path, opts, device, lambda dev: pick_dtype(opts.get("dtype", "auto"), dev, None), self.settings)
        return TorchModel(path, opts, self.settings, self.group)

    def set_threads(self, n):
        torch.set_num_threads(n)
        self.threads_set = True

    def _gpu_threads(self, device):
        """One CPU thread for torch's own CPU ops once a model runs on a
        GPU, unless --threads named a count (as vLLM sets its GPU
        workers). Such a worker runs few CPU tensor ops, each small: with
        torch's default of a thread a core, a 64-core VM took 1.9-3.6 s
        for the 448 conversions and checks of an 8B rank-16 adapter that
        one thread does in 0.27 s, and 15-30 s while other workers kept
        the cores busy. Loads (load) still convert on every core."""
        if device.type == "cuda" and not self.threads_set and not self.gpu_threads:
            torch.set_num_threads(1)
            self.gpu_threads = True

    def join(self, group, make_worker):
        if group.rank:
            def follower(g):
                self.group = g
                return make_worker(None, None)  # a follower has no output and no heartbeat
            tp.follow(group.rank, group.size, group.port, group.seed, self.settings, follower)
        leader = tp.Leader(group.argv, group.size, self.settings)
        self.group = leader.group
        return leader.guard
