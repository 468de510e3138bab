"""Delivering one claimed delivery: the deliverer, its retry policies, the breaker, and an
operator's give-up."""
