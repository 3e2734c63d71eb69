"""The run folder and what it records: the folder's lock and claim, events, checkpoints, reading them back."""
