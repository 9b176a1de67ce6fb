"""Planning: from layer specs and a byte budget to a checked plan, with arithmetic only.

The registry and plugin manager, the plan request (``request``: what one planning call needs),
the planner (one path for one rank and many), per-rank
partitioning, admission, capacity figures, plan invariants, JSON serialization and policy
comparison. Nothing here imports torch: a capacity planner's ``kvcore plan`` runs without it.
Planning imports the contract (``kvcore.*`` top-level modules) and nothing below itself.
"""
