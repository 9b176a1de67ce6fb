"""Third-party plugin packages kept frozen at the kvcore version they were written for."""
