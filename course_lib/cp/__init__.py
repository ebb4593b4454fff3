"""Context parallelism (notebook 11): the cp exercise\x27s checker, its reference computations and labs."""
