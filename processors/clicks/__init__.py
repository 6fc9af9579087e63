"""Click logs as arrays: sessions from the store, sufficient statistics, identifiability, ordinal base."""
