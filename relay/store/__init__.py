"""The relay's store upkeep and reads: migrations, retention and its pruner, inspecting
deliveries."""
