"""The engine on CPU: the real vLLM engine run on this machine's CPUs, the
harness that lets a CUDA wheel's sources run there, the benchmarks and the
keys figure (``make bench``).

Imports the queue, environments and proof packages (the proof through its
``__init__`` only).
"""
