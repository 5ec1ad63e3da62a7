"""Word lists for the `json-extract` task. Each pool that names an entity is split in two halves
(`split(pool)`): training rows draw from the first, held-out rows from the second, so the entities
(and most values) of held-out rows never appear in training."""

from __future__ import annotations

FIRST_NAMES = [
    "Maria", "James", "Aisha", "Tom", "Elena", "Omar", "Lucy", "Ken", "Nina", "Paul", "Sara", "Ivan",
    "Mei", "Leo", "Anna", "Raj", "Zoe", "Carl", "Lina", "Hugo", "Eva", "Sam", "Ida", "Ben",
]
LAST_NAMES = [
    "Lopez", "Smith", "Khan", "Berg", "Rossi", "Novak", "Chen", "Brown", "Silva", "Meyer", "Park", "Costa",
    "Weber", "Dunn", "Ito", "Moreau", "Kim", "Ford", "Haas", "Lund", "Reed", "Shaw", "Vega", "Cole",
]
PLACES = [  # (city, country)
    ("Oslo", "Norway"), ("Lyon", "France"), ("Porto", "Portugal"), ("Milan", "Italy"), ("Kyoto", "Japan"),
    ("Lima", "Peru"), ("Cairo", "Egypt"), ("Dublin", "Ireland"), ("Austin", "USA"), ("Quebec", "Canada"),
    ("Munich", "Germany"), ("Krakow", "Poland"), ("Seville", "Spain"), ("Bergen", "Norway"),
    ("Nice", "France"), ("Busan", "Korea"), ("Perth", "Australia"), ("Denver", "USA"), ("Graz", "Austria"),
    ("Naples", "Italy"), ("Osaka", "Japan"), ("Cork", "Ireland"), ("Leeds", "UK"), ("Delft", "Netherlands"),
]
PRODUCT_ADJECTIVES = [
    "Blue", "Red", "Green", "Mini", "Smart", "Steel", "Wooden", "Glass", "Silver", "Black", "Bamboo", "Cozy",
    "Retro", "Golden", "Pink", "Classic", "Solar", "Tiny", "Grey", "Ultra", "Soft", "Royal", "Urban", "Polar",
]
PRODUCT_NOUNS = [
    "kettle", "lamp", "mug", "chair", "desk", "clock", "fan", "pen", "bag", "bottle", "towel", "radio",
    "pillow", "plate", "cup", "knife", "spoon", "bowl", "rug", "vase", "candle", "mirror", "shelf", "stool",
]
EVENT_FIRST = [
    "Jazz", "Film", "Book", "Food", "Wine", "Art", "Tech", "Game", "Chess", "Craft", "Beer", "Dance",
    "Poetry", "Music", "Science", "Comedy", "Cheese", "Robot", "Garden", "Fashion", "Coffee", "Photo",
    "Design", "Yoga",
]
EVENT_SECOND = ["Night", "Fair", "Fest", "Expo", "Week", "Day", "Gala", "Show", "Summit", "Market"]
TAGS = ["friend", "work", "family", "gym", "school", "vip", "client", "team", "club", "golf", "music", "travel"]
EMAIL_DOMAINS = ["mail.com", "inbox.org", "post.net", "web.io"]


def split(pool: list) -> tuple[list, list]:
    """(train half, held-out half) of a pool."""
    half = len(pool) // 2
    return pool[:half], pool[half:]
