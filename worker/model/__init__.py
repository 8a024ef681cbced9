"""Model path: loaders -> intermediate form -> packed arrays -> data-only artifact."""
