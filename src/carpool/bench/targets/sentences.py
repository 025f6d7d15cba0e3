"""The texts ``carpool bench`` sends to an embeddings endpoint without ``--strings``: 64 sentences
of varied length, topic and script, so tokenized lengths spread as real traffic's do."""

from __future__ import annotations

__all__ = ["SENTENCES"]

SENTENCES: tuple[str, ...] = (
    "hello",
    "Good morning!",
    "How do I reset my password?",
    "The quick brown fox jumps over the lazy dog.",
    "Batching requests amortizes the fixed cost of each model call.",
    "Where is the nearest train station?",
    "Send the quarterly report to the finance team by Friday.",
    "A cat sat on the warm windowsill and watched the rain.",
    "What is the capital of Australia?",
    "Refund policy: items can be returned within 30 days of delivery.",
    "The server answered 503 because its queue was full.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "I would like to book a table for four at seven o'clock tonight, please.",
    "Error: connection reset by peer after 30 seconds.",
    "Latency percentiles tell you more than the mean does.",
    "She plays the cello in a string quartet on weekends.",
    "Wie spät ist es?",
    "Le chat dort sur le canapé depuis ce matin.",
    "¿Dónde está la biblioteca más cercana?",
    "東京は日本の首都です。",
    "机器学习模型需要大量的数据。",
    "Привет, как дела?",
    "emoji 🚗🚕🚙 and a carpool lane",
    "Order #48213 shipped on 2024-03-14 via express courier.",
    "Mix 200 g of flour with 2 eggs and 250 ml of milk, then rest the batter for an hour.",
    "The mitochondria is the powerhouse of the cell.",
    "Please summarize the attached meeting notes in three bullet points.",
    "Traffic on the northbound highway is slow because of roadworks near exit 12.",
    "Is it safe to take ibuprofen with coffee?",
    "The library closes early on public holidays.",
    "Our new pricing plan starts at nine dollars a month and includes unlimited projects.",
    "Can you recommend a good book about the history of mathematics?",
    "The committee postponed its decision until more evidence is available.",
    "Water boils at 100 degrees Celsius at sea level.",
    "My flight was cancelled; how do I get a refund or a new booking?",
    "Use a keyword-only argument when a boolean flag would be unclear at the call site.",
    "Autumn leaves drifted slowly across the empty parking lot.",
    "The invoice total does not match the purchase order; please check line 4.",
    "Neural networks learn representations by adjusting weights with gradient descent.",
    "Remind me to call the dentist tomorrow afternoon.",
    "He walked along the beach at sunset, thinking about the letter he had never sent.",
    "Install the package, restart the service, and check the logs for warnings.",
    "Which laptop has the longest battery life under two thousand dollars?",
    "The museum's new exhibition features sculptures from the early twentieth century.",
    "Customers who bought this item also bought a protective case and a screen film.",
    "Rain is expected in the evening, with temperatures falling to about eight degrees.",
    "A transformer encodes each token in the context of every other token in the sequence.",
    "Translate 'thank you very much' into Japanese.",
    "The garden needs watering twice a week during the dry summer months.",
    "Quarterly revenue grew 12 percent, driven by strong demand in the enterprise segment.",
    "What are the side effects of the new vaccine, and how long do they usually last?",
    "The kids built a fort out of couch cushions and blankets in the living room.",
    "Shipping to remote areas may take up to ten business days.",
    "Write a haiku about the first snow of winter falling on a quiet city.",
    "The API returns a paginated list; follow the next link until it is empty.",
    "Our team meets every Tuesday to review open incidents and plan the week's work.",
    "After years of restoration, the old lighthouse finally opened to visitors again.",
    "Compare the fuel efficiency of hybrid and electric cars for a daily commute of 50 km.",
    "The orchestra rehearsed the symphony's final movement until the tempo felt right.",
    "When the queue is empty the batcher dispatches at once; when it fills, it waits for "
    "the running batch to finish and sends the next one as large as it can.",
    "Dear customer, thank you for your patience while we investigated the issue with your "
    "account; the duplicate charge has been reversed and should appear within five days.",
    "In 1969, two astronauts walked on the Moon while a third orbited above, and hundreds "
    "of millions of people watched the grainy broadcast live on television around the world.",
    "The hiking trail climbs steeply through pine forest for the first three kilometres, "
    "then follows the ridge with wide views of the valley, the lake and the distant peaks, "
    "before descending to the village where a small café serves soup and fresh bread.",
    "Terms of service: by using this product you agree that your data may be processed to "
    "provide and improve the service, that you are responsible for keeping your credentials "
    "secret, and that either party may end the agreement with thirty days' written notice.",
)
