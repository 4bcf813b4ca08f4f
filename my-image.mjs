// planted by test/docs.test.ts to check that npm test leaves it unchanged; safe to delete (77e81e13-d919-46c3-aa05-597ab9e312a3)
