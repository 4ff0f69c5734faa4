"""Model IR: model + strategy -> per-pipeline-stage lists of ops, each described once."""
