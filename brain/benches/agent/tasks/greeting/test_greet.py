import unittest

from greet import greet


class GreetTest(unittest.TestCase):
    def test_default_greeting(self):
        self.assertEqual(greet("Ann"), "Hello, Ann!")

    def test_other_greeting(self):
        self.assertEqual(greet("Bo", "Good morning"), "Good morning, Bo!")


if __name__ == "__main__":
    unittest.main()
