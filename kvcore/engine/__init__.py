"""Engine: the start-up workflow an inference engine runs (specs, memory, plan, allocate, bind),
its local and distributed executors, and the store agreement ranks use to settle on one plan.
"""
