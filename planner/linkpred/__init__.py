"""Link prediction: the throughput and RTT of site pairs nobody measured, learned from the pairs
that were (docs/COSTMODEL.md section 2). ``graph`` holds the values every model reads and
returns; the models and the choice between them live beside it."""
