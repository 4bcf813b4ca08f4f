// planted by test/docs.test.ts to check that npm test leaves it unchanged; safe to delete (83c7fa2d-fd3c-429b-9246-7b7238db5406)
