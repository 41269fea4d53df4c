"""The methods: a registry (``registry``), one folder per method (its options, checks and
registration in the folder's ``__init__``, which imports no torch; its tensor code in the folder's
modules), and the tensor code the methods share (advantages, losses, token selection)."""
