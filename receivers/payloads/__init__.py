"""Pydantic models of the platform's callback bodies, one module per platform family."""
