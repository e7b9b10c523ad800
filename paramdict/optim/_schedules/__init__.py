"""The schedules' machinery, one concept per module (each says which).

The simple schedules (`StepLR`, `LambdaLR`, ...) are the public
`paramdict.optim.lr_scheduler`. The optimizer base reads schedules through
`slot.py`; nothing here imports an optimizer but `torch_state.py`.
"""
