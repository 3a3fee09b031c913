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

    def capabilities(self):
        return {"batch": True, "prefix_cache": True, "logprobs": True, "lookahead": True, "resume": True,
                "jump_forward": True, "adapters": True, "sampling": params.features(), "params": params.KEYS}

    def versions(self):
        return {"torch": torch.__version__, "cuda": bool(torch.cuda.is_available())}

    def load(self, path, opts):
        """Loads the checkpoint at path; opts as in PROTOCOL.md's load. An
        encoder (encoder.py) loads as an encserve.EncoderModel."""
        cfg = os.path.join(path, "config.json")
        if os.path.isdir(path) and os.path.exists(cfg) and is_encoder(read_json(cfg, "config.json").get("model_type")):
            from .encserve import EncoderModel
            device = pick_device(opts.get("device", "auto"))
            return EncoderModel(path, opts, device, lambda dev: pick_dtype(opts.get("dtype", "auto"), dev, None), self.settings)
        return TorchModel(path, opts, self.settings, self.group)

    def set_threads(self, n):
        torch.set_num_threads(n)

    def join(self, group, make_worker):
        if group.rank:
            def follower(g):
                self.group = g
                return make_worker(None, None)  # a follower has no output and no heartbeat
            tp.follow(group.rank, group.size, group.port, group.seed, self.settings, follower)
        leader = tp.Leader(group.argv, group.size, self.settings)
        self.group = leader.group
        return leader.guard
