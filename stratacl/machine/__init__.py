"""The machine: fabric and die facts, the switch, the kernel model, compute pricing, and the
phases every lowering produces (the engine's input)."""
