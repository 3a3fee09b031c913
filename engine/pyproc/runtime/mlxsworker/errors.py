"""Errors the worker turns into coded replies (see PROTOCOL.md)."""


class CheckpointError(Exception):
    """A checkpoint problem naming the file and, if any, the tensor."""

    def __init__(self, path, reason, tensor=""):
        super().__init__("%s: %s%s" % (path, reason, (" (tensor %s)" % tensor) if tensor else ""))
        self.path, self.reason, self.tensor = path, reason, tensor


class ProtocolError(Exception):
    """An error with a protocol code; extra fields go into the reply."""

    def __init__(self, code, message, **extra):
        super().__init__(message)
        self.code, self.extra = code, extra
