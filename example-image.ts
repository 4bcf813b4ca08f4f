// planted by test/docs.test.ts to check that npm test leaves it unchanged; safe to delete (bcb2b995-2f96-413e-b09b-af829d53d718)
