import unittest

from grades import count_passed, passed


class GradesTest(unittest.TestCase):
    def test_above_and_below(self):
        self.assertTrue(passed(80, 50))
        self.assertFalse(passed(20, 50))

    def test_equal_to_the_mark_passes(self):
        self.assertTrue(passed(50, 50))

    def test_count(self):
        self.assertEqual(count_passed([10, 50, 70, 49], 50), 2)


if __name__ == "__main__":
    unittest.main()
