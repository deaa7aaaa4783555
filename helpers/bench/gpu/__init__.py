"""The GPU check (``python -m helpers.bench gpu``): one prepared call that measures gpufeed on a
lent card, built and dry-run on CPUs so that it never reaches a card broken.

- ``check``: the call itself (``--out DIR``), its sections and their budget;
- ``card``: the card's ceilings (bf16 matmul, copy) and the model's FLOPs;
- ``model_side``, ``faults``, ``study``: the three sections;
- ``weights``: the model it runs (all-MiniLM-L6-v2's configuration and tokenizer, seeded
  random weights: what a call can carry);
- ``plan``: what a call carries, its size and the call to make (``--plan``);
- ``tables``, ``report``, ``figures``: the tables' names and reading them back, the summary
  and their move into ``data/results/gpu/``, the figures drawn from them (``--report``).

It stands on the engine, the workloads and the study, as every benchmark does.
"""
