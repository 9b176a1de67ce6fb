"""Tuning: the plan, pools and scheduler settings that serve a workload best.

A layer between the simulation and the engine: it plans candidates (:mod:`kvcore.planning`),
replays a workload through each (:mod:`kvcore.simulation`) and keeps the best and the Pareto
front (:mod:`kvcore.tuning.search`); :mod:`kvcore.tuning.split` sizes ``kind_pools``' pools
from a workload. What an engine is told to run the winner (its flags) is the integrations'
part (:mod:`kvcore.integrations.tuned`).
"""
