"""The torch backend (backend.py): paged KV memory, each model family's
forward pass in plain torch (decoder.py, encoder.py), Triton kernels and
CUDA graphs on CUDA, device sampling, lookahead, LoRA adapters, quantized
weights and tensor parallel."""
