"""Plays the platform against a receiver: realistic callback payloads and the platform's retries."""
