"""Runtime: a plan becomes device memory. Memory profiling, allocation, binding, the block pool.

This is the first layer that imports torch. It imports the contract and planning.
"""

#: The share of device memory the process may fill when nothing else is said (vLLM's default).
DEFAULT_UTILIZATION = 0.9
