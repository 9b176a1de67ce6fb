"""Runtime: a plan becomes device memory. Memory profiling, allocation, binding, the block pool.

This is the first layer that imports torch. It imports the contract and planning.
"""
