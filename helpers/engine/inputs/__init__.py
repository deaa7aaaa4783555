"""Records in: a source hands out record ids and its rows, a worker reads its own; imports
``contract`` only.

- ``sources``: the sources (lists, folders of text or images, ``make_source``);
- ``tables`` (``TableSource``: Parquet, Arrow, CSV), ``table_layouts`` (a table's schema, and
  how each format's files are read), ``table_files`` (one file of a table, opened once),
  ``table_rows`` and ``csv_rows`` (a worker reading its own rows), ``csv_scan`` (where a CSV's
  rows are, unparsed);
- ``jsonl`` and ``jsonl_rows``: JSON lines, the same way;
- ``id_checks``: which records go to ``errors/`` before a run (duplicate, empty or bad ids);
- ``carried``: a source's columns carried to the output;
- ``open_files``: what a worker keeps open between workunits, one cache for every reader above.
"""
