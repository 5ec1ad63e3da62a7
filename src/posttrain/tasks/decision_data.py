"""Customer-support messages for the `decision-routing` task, written for this project (no outside data).

Clear messages come from templates with slots ({product}, {order}, ...). Each label's templates are split in two
(`split`): training rows use the first part, held-out rows the second, so no held-out wording is seen in training.
Ambiguous messages are written out whole, each with a gold distribution over labels: how a panel of support
agents would plausibly split on it (our judgement, stated per item). They are split the same way.
"""

from __future__ import annotations

LABELS = ["billing", "technical", "account", "shipping", "refund", "other"]

TEMPLATES: dict[str, list[str]] = {
    "billing": [
        "I was charged twice for my {product} subscription this month.",
        "Why is there a {amount} charge on my card that I don't recognise?",
        "Can you send me an invoice for order {order}?",
        "My payment keeps getting declined at checkout.",
        "How do I change the credit card you bill every month?",
        "The price on my bill is higher than the plan I signed up for.",
        "I need a VAT receipt for my last payment of {amount}.",
        "You billed me after I cancelled the {product} plan.",
        "Can I switch from monthly to yearly billing?",
        "There's a late fee on my statement I don't understand.",
        "Do you accept PayPal for the {product} plan?",
        "My invoice shows the wrong company name.",
        "I got charged {amount} for an upgrade I never asked for.",
        "When will my next payment be taken?",
        "The discount code was not applied to my bill.",
        "Please explain the extra tax on order {order}.",
    ],
    "technical": [
        "The {product} app crashes every time I open it.",
        "I get error 500 when I try to upload a file.",
        "The page won't load on my {device}.",
        "Sync between my {device} and the website stopped working.",
        "The {product} keeps disconnecting from wifi.",
        "Notifications don't show up on my {device} anymore.",
        "The search bar returns nothing, even for exact names.",
        "Your API returns a timeout after {days} seconds.",
        "The {product} firmware update failed halfway.",
        "Videos freeze after a few seconds of playback.",
        "The export button does nothing when I click it.",
        "The {product} won't turn on after charging overnight.",
        "Dark mode makes the text unreadable on my {device}.",
        "I can't pair the {product} with bluetooth.",
        "The app is very slow since yesterday's update.",
        "Images in my dashboard show as broken links.",
    ],
    "account": [
        "I forgot my password and the reset email never arrives.",
        "How do I change the email address on my account?",
        "Please delete my account and all my data.",
        "My account is locked after too many login attempts.",
        "I want to add a second user to my account.",
        "How do I turn on two-factor authentication?",
        "Someone else may have logged into my account.",
        "I want to change my username.",
        "Can I merge my two accounts into one?",
        "The verification code for my account never comes by SMS.",
        "How do I update my phone number in my profile?",
        "I can't sign in with my Google login anymore.",
        "Please transfer my account to my colleague.",
        "How do I download a copy of my account data?",
        "My profile picture won't update.",
        "I need to recover an account I closed {days} days ago.",
    ],
    "shipping": [
        "Where is my order {order}? It has not arrived.",
        "The tracking for order {order} hasn't updated in {days} days.",
        "Can I change the delivery address for order {order}?",
        "My {product} was delivered to the wrong house.",
        "Do you ship to Canada?",
        "How long does express delivery take?",
        "The courier says order {order} was delivered but I have nothing.",
        "Can I pick up my {product} from a store instead?",
        "My package arrived with only half the items.",
        "Which carrier do you use for order {order}?",
        "Can you hold my delivery until next week?",
        "The box for my {product} arrived crushed but the item looks fine.",
        "Is there free shipping on orders over {amount}?",
        "My order {order} is stuck at customs.",
        "Can I get my {product} delivered on Saturday?",
        "The delivery driver left order {order} outside in the rain.",
    ],
    "refund": [
        "I want my money back for order {order}.",
        "How do I return the {product} I bought {days} days ago?",
        "The {product} is broken, please refund me.",
        "I returned order {order} two weeks ago and still have no refund.",
        "Can I get a refund if I cancel within {days} days?",
        "Please refund the {amount} for the item that never came.",
        "What is your return policy for opened items?",
        "I'd like to return the {product}, it doesn't fit.",
        "My refund for order {order} was less than I paid.",
        "Can the refund go to a different card?",
        "I want to send back the {product}; how do I get a return label?",
        "The refund for the {amount} charge hasn't reached my bank.",
        "The {product} is not as described and I want a refund.",
        "How long do refunds take to process?",
        "Can I exchange the {product} instead of getting a refund?",
        "You promised a refund for order {order} on the phone.",
    ],
    "other": [
        "Do you have any job openings?",
        "I just wanted to say your support team was great.",
        "Are you open on public holidays?",
        "Can I partner with you for a charity event?",
        "What's the address of your head office?",
        "Do you offer student discounts on the {product}?",
        "Is the {product} made from recycled materials?",
        "Who is the CEO of your company?",
        "Can I write a review of the {product} for my blog?",
        "Do you have a newsletter I can sign up to?",
        "What languages does your support speak?",
        "I have a suggestion for a new {product} colour.",
        "Is there a loyalty programme?",
        "Can I visit your factory?",
        "Do you sponsor local sports teams?",
        "Where can I find your privacy policy?",
    ],
}

SLOTS: dict[str, list[str]] = {
    "product": ["Pro", "Basic", "Family", "smart speaker", "headphones", "camera", "router", "kettle", "watch",
                "Premium", "tablet", "desk lamp"],
    "order": ["#48213", "#10977", "#55230", "#73114", "#20568", "#91842", "#36601", "#84420", "#67319", "#12785"],
    "amount": ["$9.99", "$49", "$120", "$15.50", "$4.99", "$230", "$75", "$19.99"],
    "days": ["3", "5", "10", "14", "30", "2", "7", "21"],
    "device": ["iPhone", "Android phone", "laptop", "iPad", "smart TV", "Chromebook"],
}

# Ambiguous messages: (text, gold distribution). A distribution names the labels a reasonable agent could pick
# and how often; the rest are 0. A chosen label scores its gold share as correctness (docs/decision.md).
AMBIGUOUS: list[tuple[str, dict[str, float]]] = [
    ("I was charged twice and now I can't log in to check.", {"billing": 0.6, "account": 0.4}),
    ("The package never came, so I want my money back.", {"refund": 0.6, "shipping": 0.4}),
    ("The app crashed during checkout and I think I paid anyway.", {"billing": 0.5, "technical": 0.5}),
    ("My subscription renewed after I deleted my account.", {"billing": 0.6, "account": 0.2, "refund": 0.2}),
    ("The headphones arrived broken.", {"refund": 0.6, "shipping": 0.4}),
    ("I can't update my card because the settings page errors.", {"technical": 0.5, "billing": 0.5}),
    ("I need help with my order.", {"shipping": 0.4, "refund": 0.2, "billing": 0.2, "other": 0.2}),
    ("Something is wrong with my account balance.", {"billing": 0.6, "account": 0.4}),
    ("The login code email arrives but the link is broken.", {"account": 0.5, "technical": 0.5}),
    ("Cancel everything please.", {"account": 0.4, "billing": 0.3, "refund": 0.3}),
    ("My order shows delivered but the app says pending payment.", {"shipping": 0.4, "billing": 0.3, "technical": 0.3}),
    ("Hello, is anyone there?", {"other": 1.0}),
    ("I was double charged for a delivery that never came.", {"billing": 0.4, "refund": 0.3, "shipping": 0.3}),
    ("The camera I returned still shows on my account.", {"refund": 0.5, "account": 0.5}),
    ("Why is the premium feature locked when I paid for it?", {"billing": 0.4, "account": 0.3, "technical": 0.3}),
    ("The replacement you sent is also faulty.", {"refund": 0.5, "technical": 0.3, "shipping": 0.2}),
    ("It still doesn't work.", {"technical": 0.7, "other": 0.3}),
    ("I want to talk to a manager about my last order.", {"other": 0.4, "shipping": 0.3, "refund": 0.3}),
    ("My kid bought something with my account.", {"refund": 0.4, "account": 0.3, "billing": 0.3}),
    ("The tracking page gives me an error.", {"shipping": 0.5, "technical": 0.5}),
    ("Your website took my money but no confirmation email came.", {"billing": 0.5, "technical": 0.3, "shipping": 0.2}),
    ("I moved house, what do I need to update?", {"account": 0.5, "shipping": 0.5}),
    ("Is my data safe after the outage?", {"technical": 0.5, "account": 0.3, "other": 0.2}),
    ("Can you fix the price? It went up after the update.", {"billing": 0.7, "technical": 0.3}),
    ("The router you sent doesn't work, do I send it back?", {"refund": 0.5, "technical": 0.5}),
    ("My trial ended early and I lost my files.", {"account": 0.4, "billing": 0.3, "technical": 0.3}),
    ("I never got the gift card I paid for.", {"shipping": 0.4, "billing": 0.3, "refund": 0.3}),
    ("This is the third time I'm writing about this.", {"other": 1.0}),
]


def split(pool: list, frac: float = 0.75) -> tuple[list, list]:
    """(train part, held-out part) of a pool: the first `frac` of it for training."""
    cut = round(len(pool) * frac)
    return pool[:cut], pool[cut:]
