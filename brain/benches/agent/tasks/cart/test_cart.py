import unittest

from cart import subtotal, total


class CartTest(unittest.TestCase):
    def test_subtotal(self):
        self.assertEqual(subtotal([(10, 2), (5, 1)]), 25)

    def test_small_order_pays_full_price(self):
        self.assertEqual(total([(10, 2)]), 20)

    def test_order_of_exactly_100_gets_the_discount(self):
        self.assertEqual(total([(50, 2)]), 90)


if __name__ == "__main__":
    unittest.main()
