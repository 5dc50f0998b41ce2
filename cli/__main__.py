from .main import console

console()
