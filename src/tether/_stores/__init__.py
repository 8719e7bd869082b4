"""_stores."""
