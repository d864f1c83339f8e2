"""What the client is made of: the codec, the producer's retry, and its calls by role
(administration, publishing, consuming); HTTP delivery of a group's messages."""
