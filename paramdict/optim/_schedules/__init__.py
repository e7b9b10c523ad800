"""The schedules' machinery, one concept per module.

- `states.py`: the states (`ScheduleState`, `PlateauState`) and `SlotState`,
  light, so that importing `paramdict.optim` registers them;
- `base.py`: the base classes, the checks of a state and their exact scalar
  arithmetic;
- `cyclic.py`: `CyclicLR` and `OneCycleLR`, which also cycle the momentum;
- `chain.py`: the combinators `SequentialLR` and `ChainedScheduler`;
- `plateau.py`: `ReduceLROnPlateau`, moved by a metric;
- `swa.py`: `SWALR`;
- `slot.py`: a schedule as an optimizer's `lr` (the state slot and its checks);
- `torch_state.py`: schedule positions to and from `torch.optim.lr_scheduler`
  state dicts.

The simple schedules (`StepLR`, `LambdaLR`, ...) are the public
`paramdict.optim.lr_scheduler`. The optimizer base reads schedules through
`slot.py`; nothing here imports an optimizer (but `torch_state.py`, which
converts their state dicts).
"""
