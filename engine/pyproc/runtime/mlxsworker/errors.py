"""Errors the worker turns into coded replies, and the codes (PROTOCOL.md,
"Errors": the error classification's codes, as Go's retry package names
them, where it has one)."""

INVALID = "invalid_value"  # a request or setting wrong as sent
TOO_LARGE = "request_too_large"  # a request line over the limit
CONTEXT_LENGTH = "context_length_exceeded"  # extra fields: prompt, limit
OUT_OF_MEMORY = "out_of_memory"  # the device or the KV pool
MODEL_NOT_FOUND = "model_not_found"
UNAVAILABLE = "unavailable"  # a backend, device or group that cannot serve here
CHECKPOINT = "bad_checkpoint"  # extra fields: path, tensor, reason (CheckpointError)
NOT_RUN = "not_run"  # a pipelined step sent behind a step that failed: nothing changed
INTERNAL = "engine_error"  # anything else (retry.CodeInternal); the traceback is in the log


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
