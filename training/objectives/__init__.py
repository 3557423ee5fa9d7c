"""The training objectives: the registry of names, the similarities, the assignment solver and the losses."""
