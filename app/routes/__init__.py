"""HTTP routes: thin translations between wire shapes and the serving objects."""
