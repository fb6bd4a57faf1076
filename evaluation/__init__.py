"""The one scorer (metrics = SFT filter = reward terms), benchmark runner, reports and plots."""
