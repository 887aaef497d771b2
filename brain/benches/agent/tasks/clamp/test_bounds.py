import unittest

from bounds import clamp


class ClampTest(unittest.TestCase):
    def test_below(self):
        self.assertEqual(clamp(-5, 0, 10), 0)

    def test_above(self):
        self.assertEqual(clamp(50, 0, 10), 10)

    def test_inside(self):
        self.assertEqual(clamp(7, 0, 10), 7)


if __name__ == "__main__":
    unittest.main()
