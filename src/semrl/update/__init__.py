"""The policy update: forward passes, LM head, packing, tree attention, optimizer."""
