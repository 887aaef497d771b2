import unittest

from slug import slugify


class SlugTest(unittest.TestCase):
    def test_simple(self):
        self.assertEqual(slugify("Hello World"), "hello-world")

    def test_trimmed(self):
        self.assertEqual(slugify("  Tether  Bench "), "tether-bench")


if __name__ == "__main__":
    unittest.main()
