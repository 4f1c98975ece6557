"""Token trees."""
