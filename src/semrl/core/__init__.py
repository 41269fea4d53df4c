"""The ground floor: what every stage uses and that uses no stage (process groups, fault injection,
atomic writes, safe state loading, thread waiting, JSONL files, the garbage collector around heavy
imports). Nothing here imports another semrl package (docs/architecture.md, "Floors")."""
