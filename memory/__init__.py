"""Memory layers 1-3 and the provider contract. Imports nothing from gateway/ or adapters/."""
