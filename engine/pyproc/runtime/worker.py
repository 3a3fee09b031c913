"""mlxserving worker: runs models for the Go supervisor over stdio.

One JSON object per line on stdin (requests) and stdout (replies,
heartbeats); logs go to stderr. See PROTOCOL.md beside the Go code. The
runtime itself is the mlxsworker package beside this file.
"""
from mlxsworker.main import main

if __name__ == "__main__":
    main()
